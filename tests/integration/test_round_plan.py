"""The round plan is built once per shape and reused: the per-round values (splits, parent state handles,
staging prefixes) reach the tasks as Spark local properties, so every round still processes its own data."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.demo.generate import generate
from pipeline.demo.oracle import compare, expected
from pipeline.jobs import get_job
from pipeline.runtime.driver.runner import JobRunner

pytestmark = [pytest.mark.spark]


def test_one_plan_for_all_rounds_and_exact_output(tmp_path):
    src = (tmp_path / "src").as_uri()
    generate(src, epochs=5, partitions=3, orders_per_epoch=400, seed=5)
    cfg = load_config(env={}, source_uri=src, checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), parallelism=2,
                      round_target_seconds=0)   # every round the same shape (a first round of one epoch is another)
    r = JobRunner(get_job("orders_payments"), cfg, echo=lambda m: None)
    rep = r.run()
    assert len(rep.completed) >= 5
    assert len(r._plans) == 1, list(r._plans)  # same shape every round: built and analysed once
    # every checkpoint has state files of its own (the tasks wrote where this round's values told them)
    uris = [h.file.uri for cp in r.coordinator.store.list() for hs in cp.metadata.operators.values()
            for h in hs if h.file]
    assert len(uris) == len(set(uris))
    out = tmp_path / "export"
    r.export("paid_orders", str(out / "paid_orders"))
    r.export("merchant_revenue", str(out / "merchant_revenue"))
    res = compare(expected(src), str(out / "paid_orders"), str(out / "merchant_revenue"))
    assert res.ok, res.to_dict()
    assert pq.read_table(out / "paid_orders").num_rows > 0
