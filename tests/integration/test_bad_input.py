"""Bad input never disappears silently: dead-letter records counted in the checkpoint stats (default), or
the epoch fails with a message naming the file and the partition (PIPELINE_BAD_RECORDS=fail)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from pipeline.config import load_config
from pipeline.demo.generate import generate
from pipeline.demo.oracle import compare, expected
from pipeline.exceptions import MalformedInputError
from pipeline.jobs import get_job
from pipeline.runtime.driver.runner import JobRunner

pytestmark = [pytest.mark.spark]


def _cfg(root: str, **kw):
    return load_config(env={}, source_uri=f"{root}/src", checkpoint_uri=f"{root}/ckpt", sink_uri=f"{root}/sink",
                       parallelism=2, **kw)


def test_dead_letter_policy_counts_and_keeps_everything_else(tmp_path):
    root = (tmp_path / "s").as_uri()
    g = generate(f"{root}/src", epochs=3, partitions=4, orders_per_epoch=400, seed=5, bad_records=True)
    runner = JobRunner(get_job("orders_payments"), _cfg(root), echo=lambda m: None)
    rep = runner.run()
    assert rep.completed, rep.messages
    total = {"orders": 0, "payments": 0}
    for cp in runner.coordinator.store.list():
        for s, n in cp.metadata.stats.dead_letters.items():
            total[s] += n
    # the rounds that read the bad files/rows are all still retained (3 epochs, retain 3)
    # generator docs: orders = 1 unreadable file (one whole-file record) + 3 rows of a schema-mismatched
    # file + 3 rows with a null/empty order_id; payments = 2 rows with a null/empty order_id
    assert g.bad_records
    assert total == {"orders": 7, "payments": 2}, (total, g.bad_records)
    # every dead-letter record names its file, partition and the problem
    fs = pafs.LocalFileSystem()
    dl = tmp_path / "s" / "ckpt" / "_dead_letter" / "orders_payments"
    records = []
    for info in fs.get_file_info(pafs.FileSelector(str(dl), recursive=True)):
        if info.type == pafs.FileType.File and info.path.endswith(".jsonl"):
            records += [json.loads(l) for l in Path(info.path).read_text().splitlines() if l.strip()]
    assert len(records) >= 5
    for r in records:
        assert r.get("error") and "partition" in r and (r.get("file") or r.get("uri"))
    out = tmp_path / "out"
    runner.export("paid_orders", str(out / "paid_orders"))
    runner.export("merchant_revenue", str(out / "merchant_revenue"))
    report = compare(expected(f"{root}/src"), str(out / "paid_orders"), str(out / "merchant_revenue"))
    assert report.ok, report.to_dict()


def test_fail_policy_names_file_and_partition(tmp_path):
    root = (tmp_path / "f").as_uri()
    generate(f"{root}/src", epochs=2, partitions=4, orders_per_epoch=300, seed=6, bad_records=True)
    runner = JobRunner(get_job("orders_payments"), _cfg(root, bad_records="fail"), echo=lambda m: None)
    with pytest.raises(MalformedInputError) as ei:
        runner.run()
    msg = str(ei.value)
    assert "partition" in msg and ("parquet" in msg or "jsonl" in msg), msg
    # nothing was committed for the failing epoch: no checkpoint references the bad data
    assert all(cp.metadata.stats.dead_letters.get("orders", 0) == 0 for cp in runner.coordinator.store.list())
