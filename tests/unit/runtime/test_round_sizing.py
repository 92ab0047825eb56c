"""The time bound on a round's epochs (pipeline/runtime/driver/round_sizing.py): first round one epoch, then as many
as the last round's time per epoch fits into PIPELINE_ROUND_TARGET_SECONDS, within PIPELINE_MAX_EPOCHS_PER_ROUND."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import load_config
from pipeline.exceptions import ConfigError
from pipeline.runtime.driver.round_sizing import RoundSizer


def test_the_first_round_carries_one_epoch_then_the_rounds_fit_the_target():
    s = RoundSizer(max_epochs=8, target_seconds=30)
    assert s.limit() == 1
    s.observe(1, 12.0)            # the first round: start-up costs included
    assert s.limit() == 2
    s.observe(2, 8.0)             # 4 s per epoch
    assert s.limit() == 7
    s.observe(7, 7.0)             # 1 s per epoch: capped by max_epochs
    assert s.limit() == 8
    s.observe(8, 320.0)           # 40 s per epoch: one epoch alone is over the target, still one round
    assert s.limit() == 1
    assert s.limit(remaining=3) == 1


def test_no_time_bound_and_the_remaining_epochs():
    s = RoundSizer(max_epochs=4, target_seconds=0)
    assert s.limit() == 4 and s.limit(remaining=2) == 2
    s.observe(4, 1000.0)
    assert s.limit() == 4
    s.observe(0, 5.0)             # a round that completed nothing teaches nothing
    assert s.limit() == 4


@given(st.integers(1, 16), st.floats(0.0, 120.0), st.lists(st.tuples(st.integers(1, 16), st.floats(0.0, 600.0)),
                                                          max_size=6))
def test_a_bounded_round_is_predicted_to_end_within_the_target(max_epochs, target, rounds):
    s = RoundSizer(max_epochs=max_epochs, target_seconds=target)
    for n, wall in rounds:
        s.observe(n, wall)
    k = s.limit()
    assert 1 <= k <= max_epochs
    if target > 0 and s.seconds_per_epoch is not None and k > 1:
        assert k * s.seconds_per_epoch <= target + 1e-9


def test_config_key():
    assert load_config(env={}).round_target_seconds == 30.0
    assert load_config(env={"PIPELINE_ROUND_TARGET_SECONDS": "0"}).round_target_seconds == 0.0
    with pytest.raises(ConfigError, match="PIPELINE_ROUND_TARGET_SECONDS=-1"):
        load_config(env={"PIPELINE_ROUND_TARGET_SECONDS": "-1"})
