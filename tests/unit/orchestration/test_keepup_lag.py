"""Does a job keep up with its epochs, and by how much does it fall behind (``pipeline.orchestration.keepup``): what
the epoch task logs when a run completes, what the plugin's job page says, and when a waiting trigger wakes."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline.orchestration.keepup import job_lag, lag_report, trigger_sleep

pytestmark = [pytest.mark.unit]

E = 30


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def test_a_run_that_completes_within_its_epoch_keeps_up():
    n = 100  # epoch 100 ends at 3030 s
    lag = lag_report("orders", n, E, now=3030 + 21.5, lateness_seconds=5)
    assert not lag.behind and lag.epochs_waiting == 0 and lag.lag_s == 21.5
    msg = lag.message()
    assert "keeps up" in msg and "21.5 s after it ended" in msg and "8.5 s to spare in the 30-s epoch" in msg, msg
    assert lag.to_dict() == {"epoch": n, "lag_s": 21.5, "epoch_seconds": E, "epochs_waiting": 0, "behind": False,
                             "excess_s": 0.0}


def test_a_run_that_takes_longer_than_an_epoch_says_it_falls_behind_and_by_how_much():
    lag = lag_report("orders", 100, E, now=3030 + 41.0)
    assert lag.behind and lag.epochs_waiting == 1 and lag.excess_s == 11.0
    msg = lag.message()
    assert "FALLING BEHIND" in msg and "41.0 s after it ended" in msg and "11.0 s more than the 30-s epoch" in msg
    assert "1 epoch (30 s of data) ended meanwhile and waits" in msg, msg
    far = lag_report("orders", 100, E, now=3030 + 95.0)
    assert far.epochs_waiting == 3 and "3 epochs (90 s of data)" in far.message()


def test_a_waiting_trigger_wakes_when_the_allowed_lateness_has_passed():
    # epoch 100 ends at 3030 s, lateness 5 s: ready at 3035 s
    assert trigger_sleep(100, E, 5, now=3031.0, poke=3) == 3           # a poke before the lateness ends
    assert trigger_sleep(100, E, 5, now=3033.5, poke=3) == pytest.approx(1.55)  # wake right after it
    assert trigger_sleep(100, E, 5, now=3034.99, poke=3) == 0.2        # never a busy loop
    assert trigger_sleep(100, E, 5, now=3040.0, poke=3) == 3           # past it: partitions lag, poke as usual
    assert trigger_sleep(100, E, 5, now=3034.0, poke=0) == 0           # a zero poke stays zero (tests)


def _row(cid: int, epoch: int, *, delay: float, status: str = "COMPLETED", duration: float = 4.0) -> dict:
    end = (epoch + 1) * E
    return {"checkpoint_id": cid, "kind": "checkpoint", "status": status, "epoch": epoch,
            "barrier_time": _iso(end), "trigger_time": _iso(end + delay - duration), "duration_ms": duration * 1000}


def test_the_job_page_says_whether_the_job_keeps_up_from_the_checkpoint_history():
    from pipeline.orchestration.ui import render_job_page
    rows = [_row(12, 101, delay=19.0), _row(11, 100, delay=22.0), _row(10, 99, delay=18.0),
            {"checkpoint_id": 13, "kind": "checkpoint", "status": "PENDING", "epoch": 102}]
    up = job_lag("orders", rows, E, now=(101 + 1) * E + 25)
    assert not up.behind and up.recent_delays_s == (19.0, 22.0, 18.0) and up.recent_median_s == 19.0
    assert up.summary().startswith("Keeping up: the newest checkpoint is epoch 101, which ended 25 s ago")
    html = render_job_page("orders", "epochal_orders", rows, [], 12, {}, {}, lag=up)
    assert "class='ok'>Keeping up" in html and "median 19.0 s after their end" in html

    late = job_lag("orders", rows, E, now=(101 + 1) * E + 75)
    assert late.behind and late.now is not None and late.now.epochs_waiting == 2
    text = late.summary()
    assert text.startswith("Falling behind: the newest checkpoint is epoch 101, which ended 75 s ago; 2 epochs "
                           "(60 s of data) ended since and are not checkpointed yet (epoch length 30 s)"), text
    html = render_job_page("orders", "epochal_orders", rows, [], 12, {}, {}, lag=late)
    assert "<div class='warn'><b>Falling behind" in html
    assert job_lag("orders", rows[3:], E, now=0).now is None  # no completed checkpoint: nothing to say
