"""Snapshot bytes do not depend on row order, and names are attempt-unique only inside Spark tasks."""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from pipeline.fileio import LocalFileIO
from pipeline.state.attempts import attempt_uri, canonical_order
from pipeline.state.backend import write_table

pytestmark = [pytest.mark.unit]


def test_two_attempts_over_shuffled_rows_write_identical_bytes(tmp_path):
    rng = np.random.default_rng(3)
    t = pa.table({"_kg": rng.integers(0, 8, 500), "k": [f"k{i}" for i in rng.integers(0, 90, 500)],
                  "v": rng.normal(size=500), "ts": pa.array(rng.integers(0, 10**12, 500)).cast(pa.timestamp("us"))})
    shuffled = t.take(pa.array(rng.permutation(500)))
    fio = LocalFileIO()
    a = write_table(fio, (tmp_path / "a.parquet").as_uri(), t)
    b = write_table(fio, (tmp_path / "b.parquet").as_uri(), shuffled)
    assert a.sha256 == b.sha256 and a.rows == 500
    assert hashlib.sha256((tmp_path / "b.parquet").read_bytes()).hexdigest() == b.sha256
    assert canonical_order(shuffled).equals(canonical_order(t))


def test_attempt_uri_is_the_uri_outside_a_task():
    assert attempt_uri("s3://b/x/kg-00000-00063.parquet") == "s3://b/x/kg-00000-00063.parquet"
