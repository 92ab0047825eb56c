"""The parts of ``run --follow`` that need no Spark (the loop itself runs in tests/e2e/test_follow.py): the graceful
stop flag and its signal handlers, the bounds and their usage errors, the poll interval, the summary."""
from __future__ import annotations

import os
import signal
import time

import pytest

from pipeline.cli import main
from pipeline.exceptions import ConfigError
from pipeline.runtime.driver.follow import FollowOptions, FollowReport, StopRequest, default_poll_seconds

pytestmark = pytest.mark.unit


def test_a_first_signal_asks_for_a_graceful_stop_and_wakes_the_wait():
    stop = StopRequest()
    before = signal.getsignal(signal.SIGTERM)
    stop.install()
    try:
        assert not stop.requested and stop.wait(0.01) is False
        os.kill(os.getpid(), signal.SIGTERM)      # handled in this (main) thread before kill() returns
        assert stop.requested and stop.reason == "SIGTERM"
        t0 = time.monotonic()
        assert stop.wait(30) is True               # returns at once: the stop is pending
        assert time.monotonic() - t0 < 5
        with pytest.raises(KeyboardInterrupt):     # a second signal: stop now
            os.kill(os.getpid(), signal.SIGINT)
        assert stop.reason == "SIGTERM"            # the first reason is kept
    finally:
        stop.close()
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are removed again
    stop.close()  # idempotent


def test_a_request_from_another_thread_wakes_a_waiting_follower():
    import threading
    stop = StopRequest()
    try:
        threading.Timer(0.2, lambda: stop.request("test")).start()
        t0 = time.monotonic()
        assert stop.wait(30) is True and stop.reason == "test"
        assert time.monotonic() - t0 < 10
    finally:
        stop.close()


def test_default_poll_interval_is_a_tenth_of_the_epoch_within_bounds():
    assert default_poll_seconds(1) == 0.5
    assert default_poll_seconds(60) == 6.0
    assert default_poll_seconds(3600) == 10.0


@pytest.mark.parametrize("kw, msg", [
    ({"poll_seconds": 0}, "--poll-seconds must be > 0"),
    ({"max_idle_seconds": -1}, "--max-idle-seconds must be > 0"),
    ({"epochs": -1}, "--epochs must be >= 0"),
    ({"savepoint_target": "file:///tmp/sp"}, "--target needs --stop-with-savepoint"),
])
def test_bad_bounds_are_refused(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        FollowOptions(**kw)


@pytest.mark.parametrize("argv", [
    ["run", "--job", "orders_payments", "--poll-seconds", "1"],
    ["run", "--job", "orders_payments", "--max-idle-seconds", "5"],
    ["run", "--job", "orders_payments", "--stop-with-savepoint"],
    ["run", "--job", "orders_payments", "--follow", "--target", "file:///tmp/sp"],
    ["run", "--job", "orders_payments", "--follow", "--poll-seconds", "0"],
])
def test_follow_flags_without_follow_or_with_bad_values_exit_2_before_any_side_effect(argv, tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.setenv("PIPELINE_CHECKPOINT_URI", (tmp_path / "ckpt").as_uri())
    assert main(argv) == 2
    assert "configuration error" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()


def test_the_summary_names_why_it_stopped_the_checkpoints_and_latencies():
    rep = FollowReport("j", restored_from=4, stopped="SIGTERM", wall_s=75.0, savepoint="file:///sp/sp-9")
    rep.add(5, 100, 40, 1.5)
    rep.add(6, 101, 60, 2.5)
    rep.add(7, 102, 0, 3.5)
    line = rep.summary()
    assert line.startswith("job j: follow stopped (SIGTERM) after 1 min 15 s; restored from checkpoint 4; ")
    assert "completed 3 checkpoint(s) 5..7 (epochs 100..102); records 100" in line
    assert "latency median 2.5 s, max 3.5 s; savepoint file:///sp/sp-9" in line
    d = rep.to_dict()
    assert d["checkpoints_completed"] == [5, 6, 7] and d["latency_s"] == {"last": 3.5, "median": 2.5, "max": 3.5}
    assert FollowReport("j", stopped="idle").summary().endswith("completed no checkpoint; records 0")
