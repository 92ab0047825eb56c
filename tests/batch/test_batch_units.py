"""Units of the batch evaluation that need no Spark."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pipeline.batch.prefix import Prefix, ordinal

pytestmark = [pytest.mark.unit]


def test_the_library_does_not_import_the_demo():
    code = ("import sys, pipeline.batch, pipeline.quality.collect, pipeline.quality.recovery, "
            "pipeline.quality.validate; bad = [m for m in sys.modules if m.startswith('pipeline.demo')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_processing_epoch_lookup_follows_the_barrier_log():
    """Barrier k of a partition that was idle stays where it was; rows after it belong to the next barrier."""
    pre = Prefix(7, 60, {"s": {0: (5, 0)}}, {4: {"s": {0: (2, 10)}}, 5: {"s": {0: (2, 10)}}, 6: {"s": {0: (4, 3)}}})
    ords, eps = pre.lookup("s")[0]
    assert eps.tolist() == [4, 5, 6, 7]
    rows = np.array([ordinal(2, 9), ordinal(2, 10), ordinal(4, 2), ordinal(4, 3)])
    idx = np.searchsorted(ords, rows, side="right")
    assert eps[idx].tolist() == [4, 6, 6, 7]   # (2,10) was behind barriers 4 and 5: consumed for epoch 6


def test_prefix_epoch_arithmetic():
    pre = Prefix(3, 60, {}, {})
    assert pre.end_us(3) == 4 * 60_000_000 and pre.epoch_us == 60_000_000
