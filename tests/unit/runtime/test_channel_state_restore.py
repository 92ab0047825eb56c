"""Unaligned channel state in ``_metadata``: open-ended source ranges survive the JSON round trip, and a
restore reads on at the ranges' start and replays the in-flight files first (no Spark)."""
from __future__ import annotations

import pytest

from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, Position
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.config import load_config
from pipeline.exceptions import ConfigError
from pipeline.job import Job
from pipeline.jobs.orders_payments import ORDERS_SCHEMA, PAYMENTS_SCHEMA, build_job
from pipeline.runtime.driver.runner import JobRunner

pytestmark = pytest.mark.unit


def _md(**kw) -> CheckpointMetadata:
    return CheckpointMetadata(
        job="orders_payments", checkpoint_id=5, parent_id=4, epoch=9, barrier_time="2026-01-01T00:10:00Z",
        checkpoint_mode="exactly_once", alignment="unaligned", max_parallelism=128, parallelism=2,
        positions={"orders": {"0": Position(3, 0), "1": Position(2, 5)}, "payments": {"0": Position(3, 0)}},
        barriers={"orders": {"0": Position(3, 0)}, "payments": {"0": Position(3, 0)}},
        channel_state=(
            ChannelStateHandle("paid_orders_join", 1, "left", file=FileHandle("file:///x/c.parquet", 7, 99, "ab")),
            ChannelStateHandle("paid_orders_join", 0, "orders/partition=1", source="orders", partition=1,
                               start=Position(2, 40), end=None),
        ), **kw)


def test_open_range_round_trips() -> None:
    md = _md()
    back = CheckpointMetadata.from_json(md.to_json())
    assert back == md and back.channel_state[1].end is None and back.channel_state[1].start == Position(2, 40)
    with pytest.raises(ValueError):
        ChannelStateHandle("j", 0, "c", source="s", partition=0, start=None, end=Position(1, 0))


def test_restore_cursor_resumes_at_range_start_and_replays_files(tmp_path) -> None:
    cfg = load_config(env={}, source_uri=(tmp_path / "s").as_uri(), checkpoint_uri=(tmp_path / "c").as_uri(),
                      sink_uri=(tmp_path / "k").as_uri(), unaligned=True)
    r = JobRunner(build_job(), cfg)
    cur = r._cursor_from(_md())
    assert cur.positions["orders"]["1"] == Position(2, 40)   # after the rows in flight (they are in the file)
    assert cur.positions["orders"]["0"] == Position(3, 0)
    assert [c.file.uri for c in cur.inflight["paid_orders_join"] if c.file] == ["file:///x/c.parquet"]
    assert cur.inflight["paid_orders_join"][0].channel == "left"


def test_unaligned_needs_sources_feeding_only_the_join(tmp_path) -> None:
    job = Job("two_users")
    o = job.source("orders", ORDERS_SCHEMA, key="order_id")
    p = job.source("payments", PAYMENTS_SCHEMA, key="order_id")
    o.select("order_id", "merchant_id AS m").join(p.select("order_id", "payment_id"), on="order_id", uid="j").sink("x")
    o.aggregate(uid="per_merchant", key="merchant_id", aggs={"n": ("count", None)}).sink("y", mode="upsert")
    cfg = load_config(env={}, source_uri=(tmp_path / "s").as_uri(), checkpoint_uri=(tmp_path / "c").as_uri(),
                      sink_uri=(tmp_path / "k").as_uri(), unaligned=True)
    with pytest.raises(ConfigError, match="feed only the join"):
        JobRunner(job, cfg)
    JobRunner(job, cfg.with_(unaligned=False))  # aligned: fine
