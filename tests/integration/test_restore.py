"""Restore with a real local Spark: fallback from a corrupt/missing checkpoint, savepoints (self-contained,
NO_CLAIM), rescaling 2->4 and 4->1 with results identical to an unchanged run, operator-uid mismatch."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.demo.generate import generate
from pipeline.demo.oracle import compare, expected
from pipeline.exceptions import IncompatibleStateError, NoValidCheckpointError
from pipeline.job import Job
from pipeline.jobs import get_job
from pipeline.jobs.orders_payments import ORDERS_SCHEMA, PAYMENTS_SCHEMA
from pipeline.runtime.driver.runner import JobRunner

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("src").as_uri()
    generate(root, epochs=6, partitions=3, orders_per_epoch=500, seed=21)
    return root


def _runner(tmp: Path, source: str, name: str, job: Job | None = None, **kw) -> JobRunner:
    cfg = load_config(env={}, source_uri=source, checkpoint_uri=(tmp / name / "ckpt").as_uri(),
                      sink_uri=(tmp / name / "sink").as_uri(), **{"parallelism": 2, **kw})
    msgs: list[str] = []
    r = JobRunner(job or get_job("orders_payments"), cfg, echo=msgs.append)
    r.messages = msgs  # type: ignore[attr-defined]
    return r


def _assert_exact(r: JobRunner, tmp: Path, source: str) -> tuple[list, list]:
    out = tmp / f"export-{id(r)}"
    r.export("paid_orders", str(out / "paid_orders"))
    r.export("merchant_revenue", str(out / "merchant_revenue"))
    rep = compare(expected(source), str(out / "paid_orders"), str(out / "merchant_revenue"))
    assert rep.ok, rep.to_dict()
    paid = sorted(pq.read_table(out / "paid_orders").to_pylist(), key=lambda d: d["order_id"])
    rev = sorted(pq.read_table(out / "merchant_revenue").to_pylist(), key=lambda d: d["merchant_id"])
    return paid, rev


def test_corrupt_latest_checkpoint_falls_back_with_message(tmp_path, source):
    r = _runner(tmp_path, source, "corrupt", retained_checkpoints=3)
    r.run(3)
    latest = r.coordinator.store.latest()
    victim = next(h.file.uri for hs in latest.metadata.operators.values() for h in hs if h.file)
    path = victim[len("file://"):]
    with open(path, "r+b") as f:  # flip bytes in place: same size, different checksum
        f.seek(10)
        f.write(b"\x00\x01\x02\x03")
    r2 = _runner(tmp_path, source, "corrupt")
    rep = r2.run()
    assert rep.restored_from == latest.checkpoint_id - 1
    assert any(victim in m and f"{latest.checkpoint_id}" in m for m in rep.messages), rep.messages
    _assert_exact(r2, tmp_path, source)


def test_missing_state_file_falls_back_and_never_starts_from_scratch(tmp_path, source):
    r = _runner(tmp_path, source, "missing", retained_checkpoints=2)
    r.run(3)
    for cp in r.coordinator.store.list():  # break every retained checkpoint
        f = next(h.file.uri for hs in cp.metadata.operators.values() for h in hs if h.file)
        os.remove(f[len("file://"):])
    with pytest.raises(NoValidCheckpointError) as ei:
        _runner(tmp_path, source, "missing").run()
    assert "refusing to start from scratch" in str(ei.value)


def test_savepoint_is_self_contained_and_survives_retention(tmp_path, source):
    r = _runner(tmp_path, source, "sp", retained_checkpoints=1)
    r.run(2)
    loc = r.savepoint()
    assert "/savepoints/" in loc
    md = json.loads(Path(loc[len("file://"):], "_metadata").read_text())
    files = [h["file"]["uri"] for hs in md["operators"].values() for h in hs if h.get("file")]
    assert files and all(f.startswith(loc + "/") for f in files)  # references nothing outside itself
    r.run()  # more checkpoints; retention keeps only 1
    assert all(Path(f[len("file://"):]).exists() for f in files)
    # restore from it (NO_CLAIM): the savepoint's files are never modified or deleted
    before = {f: Path(f[len("file://"):]).stat().st_mtime_ns for f in files}
    res = r.restore(loc)  # validates the restored checkpoint with the GE suites
    assert res["validation"]["success"], res["validation"]["summary"]
    r.run()
    assert {f: Path(f[len("file://"):]).stat().st_mtime_ns for f in files} == before
    _assert_exact(r, tmp_path, source)


@pytest.mark.slow
def test_rescale_2_to_4_to_1_identical_to_unchanged_run(tmp_path, source):
    base = _runner(tmp_path, source, "base")
    base.run()
    expected_rows = _assert_exact(base, tmp_path, source)

    r = _runner(tmp_path, source, "rescale")
    r.run(2)
    sp = r.savepoint()
    r.restore(sp, parallelism=4, validate=False)
    rep = r.run(2, parallelism=4)
    assert rep.completed and all(
        cp.metadata.parallelism == 4 for cp in r.coordinator.store.list()[-2:])
    latest = r.coordinator.store.latest()
    assert latest.metadata.max_parallelism == 128
    r.restore(str(latest.checkpoint_id), parallelism=1, validate=False)
    r.run(parallelism=1)
    assert r.coordinator.store.latest().metadata.parallelism == 1
    assert _assert_exact(r, tmp_path, source) == expected_rows


def test_savepoint_with_foreign_operator_needs_allow_non_restored_state(tmp_path, source):
    r = _runner(tmp_path, source, "uids")
    r.run(2)
    sp = r.savepoint()
    # same job name, but the aggregate got a new uid: its old state cannot be mapped
    job = Job("orders_payments")
    o = job.source("orders", ORDERS_SCHEMA, key="order_id")
    p = job.source("payments", PAYMENTS_SCHEMA, key="order_id")
    cap = p.filter("status = 'captured'").select("order_id", "payment_id", "amount AS paid_amount",
                                                 "event_time AS payment_time")
    paid = o.select("order_id", "customer_id", "merchant_id", "amount AS order_amount",
                    "event_time AS order_time").join(cap, on="order_id", uid="paid_orders_join")
    paid.sink("paid_orders")
    paid.aggregate(uid="revenue_v2", key="merchant_id",
                   aggs={"paid_orders": ("count", None), "revenue": ("sum", "paid_amount")}).sink(
        "merchant_revenue", mode="upsert")
    r2 = _runner(tmp_path, source, "uids", job=job)
    with pytest.raises(IncompatibleStateError) as ei:
        r2.restore(sp, validate=False)
    assert "merchant_revenue_agg" in str(ei.value)
    res = r2.restore(sp, allow_non_restored_state=True, validate=False)
    assert res["dropped_operators"] == ["merchant_revenue_agg"]
